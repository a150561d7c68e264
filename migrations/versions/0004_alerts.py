"""alerts: episodes, transitions, deliveries, silences, per-instance overrides (issue 8)

Revision ID: 0004_alerts
Revises: 0001
Create Date: 2026-11-29 07:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = "0004_alerts"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("active_key", sa.String(length=512), nullable=True),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=True),
        sa.Column("instance_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("opened_at", sa.Float(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("fired_at", sa.Float(), nullable=True),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.Column("last_eval", sa.Float(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("baseline", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("hints", sa.JSON(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("acked_at", sa.Float(), nullable=True),
        sa.Column("ack_note", sa.Text(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("uq_alerts_active_key", "alerts", ["active_key"], unique=True)
    op.create_index("ix_alerts_key_opened", "alerts", ["key", "opened_at"])
    op.create_index("ix_alerts_state", "alerts", ["state"])
    op.create_table(
        "alert_transitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_alert_transitions_alert", "alert_transitions", ["alert_id"])
    op.create_index("ix_alert_transitions_ts", "alert_transitions", ["ts"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=True),
        sa.Column("channel", sa.String(length=128), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("claimed_until", sa.Float(), nullable=True),
        sa.Column("sent_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_alert_deliveries_due", "alert_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_alert_deliveries_alert", "alert_deliveries", ["alert_id"])
    op.create_table(
        "alert_silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=True),
        sa.Column("host_id", sa.Integer(), nullable=True),
        sa.Column("rule", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_alert_silences_until", "alert_silences", ["until"])
    op.create_table(
        "alert_overrides",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("instance_id", "rule", name="uq_alert_overrides_instance_rule"),
    )


def downgrade() -> None:
    op.drop_table("alert_overrides")
    op.drop_index("ix_alert_silences_until", table_name="alert_silences")
    op.drop_table("alert_silences")
    op.drop_index("ix_alert_deliveries_alert", table_name="alert_deliveries")
    op.drop_index("ix_alert_deliveries_due", table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index("ix_alert_transitions_ts", table_name="alert_transitions")
    op.drop_index("ix_alert_transitions_alert", table_name="alert_transitions")
    op.drop_table("alert_transitions")
    op.drop_index("ix_alerts_state", table_name="alerts")
    op.drop_index("ix_alerts_key_opened", table_name="alerts")
    op.drop_index("uq_alerts_active_key", table_name="alerts")
    op.drop_table("alerts")
