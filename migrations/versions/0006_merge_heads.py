"""One head: joins the rollups, controller, alerts and A/B branches

Every migration after this one revises the single head, so `alembic upgrade head` and
`alembic heads` answer one revision.

Revision ID: 0006_merge
Revises: 0002_rollups_late, 0003_controller, 0004_alerts, 0005_ab
"""

revision = "0006_merge"
down_revision = ("0002_rollups_late", "0003_controller", "0004_alerts", "0005_ab")
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
