"""A/B experiments and their runs

Revision ID: 0005_ab
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa


revision = "0005_ab"
down_revision = "0001"
branch_labels = ("ab",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ab_experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("profile_a", sa.String(length=64), nullable=False),
        sa.Column("profile_b", sa.String(length=64), nullable=False),
        sa.Column("version_a_id", sa.Integer(), nullable=True),
        sa.Column("version_b_id", sa.Integer(), nullable=True),
        sa.Column("previous_version_id", sa.Integer(), nullable=True),
        sa.Column("workload", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("runs_per_arm", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("current_run", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("rollout_id", sa.Integer(), nullable=True),
        sa.Column("step_started_at", sa.Float(), nullable=True),
        sa.Column("owner", sa.String(length=128), nullable=True),
        sa.Column("lease_until", sa.Float(), nullable=True),
        sa.Column("verdict", sa.JSON(), nullable=False),
        sa.Column("requested_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_ab_experiments_instance", "ab_experiments", ["instance_id", "created_at"])
    op.create_index(
        "uq_ab_experiments_active", "ab_experiments", ["instance_id"], unique=True,
        sqlite_where=sa.text("finished_at IS NULL"), postgresql_where=sa.text("finished_at IS NULL"),
    )
    op.create_table(
        "ab_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("arm", sa.String(length=1), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("rollout_id", sa.Integer(), nullable=True),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["ab_experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("experiment_id", "idx", name="uq_ab_runs_idx"),
    )


def downgrade() -> None:
    op.drop_table("ab_runs")
    op.drop_index("uq_ab_experiments_active", table_name="ab_experiments")
    op.drop_index("ix_ab_experiments_instance", table_name="ab_experiments")
    op.drop_table("ab_experiments")
