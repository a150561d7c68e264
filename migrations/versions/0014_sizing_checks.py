"""sizing checks: sizing predictions put to the test, kept (issue 27 item 5)

An A/B of the current tier size against the suggested one, or a size applied and watched
afterwards: per size, predicted vs measured reloads and TTFT saved.

Revision ID: 0014_sizing_checks
Revises: 0013_sample_chunks
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_sizing_checks"
down_revision = "0013_sample_chunks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sizing_checks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("profile", sa.String(length=64), nullable=False),
        sa.Column("prediction", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_sizing_checks_instance", "sizing_checks", ["instance_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_sizing_checks_instance", table_name="sizing_checks")
    op.drop_table("sizing_checks")
