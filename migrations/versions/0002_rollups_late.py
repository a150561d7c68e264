"""dashboard rollups: series with late samples to re-roll

Revision ID: 0002_rollups_late
Revises: 0002_rollups
"""
from alembic import op
import sqlalchemy as sa


revision = "0002_rollups_late"
down_revision = "0002_rollups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollup_late",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("from_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("series_id"),
    )


def downgrade() -> None:
    op.drop_table("rollup_late")
