"""controller: profiles with history, instance current/last-known-good profile, rollouts

Revision ID: 0003_controller
Revises: 0001
Create Date: 2026-11-29 07:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003_controller'
down_revision = '0001'
branch_labels = ('controller',)
depends_on = None


def upgrade() -> None:
    op.create_table(
        'controller_profiles',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('current_version', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name'),
    )
    op.create_table(
        'controller_profile_versions',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('profile_id', sa.Integer(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('spec', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('author', sa.String(length=255), nullable=False),
        sa.Column('note', sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(['profile_id'], ['controller_profiles.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('profile_id', 'version', name='uq_profile_version'),
    )
    op.create_table(
        'controller_instance_profiles',
        sa.Column('instance_id', sa.Integer(), nullable=False),
        sa.Column('current_version_id', sa.Integer(), nullable=True),
        sa.Column('lkg_version_id', sa.Integer(), nullable=True),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['instance_id'], ['instances.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['current_version_id'], ['controller_profile_versions.id']),
        sa.ForeignKeyConstraint(['lkg_version_id'], ['controller_profile_versions.id']),
        sa.PrimaryKeyConstraint('instance_id'),
    )
    op.create_table(
        'controller_rollouts',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('instance_id', sa.Integer(), nullable=False),
        sa.Column('version_id', sa.Integer(), nullable=False),
        sa.Column('lkg_version_id', sa.Integer(), nullable=True),
        sa.Column('state', sa.String(length=32), nullable=False),
        sa.Column('message', sa.Text(), nullable=False),
        sa.Column('requested_by', sa.String(length=255), nullable=False),
        sa.Column('override_hybrid', sa.Boolean(), nullable=False),
        sa.Column('payload', sa.JSON(), nullable=False),
        sa.Column('result', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.Column('claimed_at', sa.Float(), nullable=True),
        sa.Column('claimed_by', sa.String(length=255), nullable=True),
        sa.Column('finished_at', sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(['instance_id'], ['instances.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['version_id'], ['controller_profile_versions.id']),
        sa.ForeignKeyConstraint(['lkg_version_id'], ['controller_profile_versions.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_controller_rollouts_instance', 'controller_rollouts', ['instance_id', 'created_at'])
    op.create_index('ix_controller_rollouts_state', 'controller_rollouts', ['state'])
    op.create_index(
        'uq_controller_rollouts_active', 'controller_rollouts', ['instance_id'], unique=True,
        sqlite_where=sa.text('finished_at IS NULL'), postgresql_where=sa.text('finished_at IS NULL'),
    )


def downgrade() -> None:
    op.drop_index('uq_controller_rollouts_active', table_name='controller_rollouts')
    op.drop_index('ix_controller_rollouts_state', table_name='controller_rollouts')
    op.drop_index('ix_controller_rollouts_instance', table_name='controller_rollouts')
    op.drop_table('controller_rollouts')
    op.drop_table('controller_instance_profiles')
    op.drop_table('controller_profile_versions')
    op.drop_table('controller_profiles')
