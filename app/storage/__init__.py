"""The storage layer: the only place in kvscope that speaks SQL."""
