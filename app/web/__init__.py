"""Shared web plumbing of every part: templating, form tokens (CSRF), error pages, JSON body and
id checks, static paths, background jobs, the app's own metrics, the offline API docs."""
