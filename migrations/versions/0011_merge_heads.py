"""One head again: joins the auth (0007) and sizing (0010) branches

Both were written on 0006_merge, so the scripts had two heads and `upgrade "heads"` hid it.
Every migration after this one revises "0011_merge"; tests/app/storage/test_one_head.py fails on
a second head.

Revision ID: 0011_merge
Revises: 0007_auth, 0010_sizing
"""

revision = "0011_merge"
down_revision = ("0007_auth", "0010_sizing")
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
