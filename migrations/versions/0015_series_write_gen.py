"""series write generation: exact incremental reads without time-to-live (issue 25 item 5)

`series.write_gen` counts the writes that put a sample older than what the series already held
(a late or replayed sample, which a reader may have cached past): readers that keep points
(app/derived/series_cache.py) or values computed from them (app/derived/live.py) drop what they
hold of a series whose generation moved. Plain appends at the end leave it alone.

`hosts.write_seq` counts the pushes stored for a host: an app process whose last push of a host
is the one before knows that no other process wrote that host's series in between, so its own
record of each series' newest sample is exact (app/storage/series_generation.py).

Revision ID: 0015_series_write_gen
Revises: 0014_sizing_checks
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_series_write_gen"
down_revision = "0014_sizing_checks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN on both backends (SQLite: no table rebuild; the series' identity index stays)
    op.add_column("series", sa.Column("write_gen", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("hosts", sa.Column("write_seq", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("write_seq")
    with op.batch_alter_table("series") as batch:
        batch.drop_column("write_gen")
