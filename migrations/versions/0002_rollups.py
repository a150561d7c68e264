"""dashboard rollups: 1-minute and 1-hour aggregates

Revision ID: 0002_rollups
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa


revision = "0002_rollups"
down_revision = "0001"
branch_labels = None
depends_on = None


def _bucket_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("bucket_ms", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("vmin", sa.Float(), nullable=False),
        sa.Column("vmax", sa.Float(), nullable=False),
        sa.Column("vsum", sa.Float(), nullable=False),
        sa.Column("vlast", sa.Float(), nullable=False),
        sa.Column("inc", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("series_id", "bucket_ms"),
        sqlite_with_rowid=False,
    )


def upgrade() -> None:
    _bucket_table("rollups_1m")
    _bucket_table("rollups_1h")
    op.create_table(
        "rollup_carry",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("series_id"),
    )
    op.create_table(
        "rollup_watermarks",
        sa.Column("tier", sa.String(length=8), nullable=False),
        sa.Column("done_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tier"),
    )


def downgrade() -> None:
    op.drop_table("rollup_watermarks")
    op.drop_table("rollup_carry")
    op.drop_table("rollups_1h")
    op.drop_table("rollups_1m")
