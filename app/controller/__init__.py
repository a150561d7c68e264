"""The controller: serving profiles (validated, rendered to vLLM argv through the flag allow-list),
rollouts handed to agents, their pages, JSON API and CLI (`kvscope profile`, `kvscope apply`)."""
