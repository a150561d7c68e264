"""auth: users, one-time login links, roles and host binding on tokens (issue 14)

Existing agent tokens become role "agent" bound to the host of their name, as
`kvscope token create NAME` binds new ones.

Revision ID: 0007_auth
Revises: 0006_merge
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_auth"
down_revision = "0006_merge"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agent_tokens") as batch:
        batch.add_column(sa.Column("role", sa.String(length=16), nullable=False, server_default="agent"))
        batch.add_column(sa.Column("host", sa.String(length=255), nullable=True))
    op.execute("UPDATE agent_tokens SET host = name WHERE role = 'agent'")
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("session_epoch", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_login", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "login_links",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("used_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )


def downgrade() -> None:
    op.drop_table("login_links")
    op.drop_table("users")
    with op.batch_alter_table("agent_tokens") as batch:
        batch.drop_column("host")
        batch.drop_column("role")
