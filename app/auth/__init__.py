"""Who may do what: logins, sessions, API and agent tokens, roles, the Host allow-list and the
security headers. See docs/security.md.

Every route needs a role. A route states it with `@requires(...)` (roles.py); one without it needs
"viewer" to read (GET/HEAD) and "operator" for anything else, so a new route is never open by
accident. `app.auth.install.install(app, ctx)` wires the checks into the app. This file imports
nothing, so `kvscope user ...` and the agent's CLI stay light.
"""
