"""vLLM KV-cache events: decoding the ZMQ stream and turning it into reuse-distance histograms.

The decoder and the reuse-distance passes are pure (no sockets, no clock); the subscriber is the
only part that touches ZMQ. Needs the optional extra ``kvscope[kvevents]`` (pyzmq, msgpack).
"""
