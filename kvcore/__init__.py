"""The shared core of kvscope: pure definitions that the agent and the app both import.

Standard library only. kvcore imports neither agent/ nor app/ (tests/test_import_graph.py holds
that), so the agent stays light and the app cannot redo what is defined here.

- ``kvcore.kv_vocabulary``: token sources, tiers, hit rates, colours and labels
- ``kvcore.protocol`` / ``kvcore.wire``: the wire contract and its fast serializer
- ``kvcore.exposition`` / ``kvcore.normalise``: the Prometheus text parser and the name normaliser
- ``kvcore.flag_policy``: the vLLM flag allow-list
- ``kvcore.series``: counter increase / rate, histogram quantile, share
"""
