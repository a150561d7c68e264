"""sessions: server-side login sessions with a random id (issue 29)

A cookie used to name the user id and password epoch; SQLite reuses the id of a deleted user,
so a deleted user's cookie logged in as the next user created. Sessions now name a random id
whose hash is kept here. Older cookies stop working (one new login).

Revision ID: 0012_sessions
Revises: 0011_merge
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_sessions"
down_revision = "0011_merge"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_sessions_user_id", "sessions", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_user_id", table_name="sessions")
    op.drop_table("sessions")
