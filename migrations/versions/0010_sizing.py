"""Cache sizing: KV-event reuse-distance windows per instance (issue 17)

Revision ID: 0010_sizing
Revises: 0006_merge
"""
from alembic import op
import sqlalchemy as sa


revision = "0010_sizing"
down_revision = "0006_merge"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sizing_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("start_ts", sa.Float(), nullable=False),
        sa.Column("end_ts", sa.Float(), nullable=False),
        sa.Column("block_size", sa.Integer(), nullable=True),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("bins", sa.JSON(), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_sizing_windows_instance_end", "sizing_windows", ["instance_id", "end_ts"])


def downgrade() -> None:
    op.drop_index("ix_sizing_windows_instance_end", table_name="sizing_windows")
    op.drop_table("sizing_windows")
