"""sample_chunks: raw samples sealed into compressed per-series chunks (issue 28)

Creates the chunk tables only. The existing raw table `samples` stays as it is and becomes the
head: the sealing job (app/storage/chunk_seal.py, every 30 s in the app) converts its rows into
chunks in batches of series, each batch one transaction (chunks written and head rows deleted
together), so a kill -9 loses or duplicates nothing and the next run goes on where it stopped.
The conversion runs in the background rather than inside `alembic upgrade`: a 48 h raw table of
a large fleet takes minutes to encode, and the app serves (reads see head and chunks together)
while it does.

Revision ID: 0013_sample_chunks
Revises: 0012_sessions
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_sample_chunks"
down_revision = "0012_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sample_chunks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("uq_sample_chunks_series_end", "sample_chunks", ["series_id", "end_ms"], unique=True)
    op.create_table(
        "open_chunks",
        sa.Column("series_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("series_id"),
    )


def downgrade() -> None:
    """Chunks back to raw rows is not done here: decode them with the app first (a downgrade
    of a database that has chunks would lose their samples)."""
    op.drop_table("open_chunks")
    op.drop_index("uq_sample_chunks_series_end", table_name="sample_chunks")
    op.drop_table("sample_chunks")
