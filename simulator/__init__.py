"""kvscope's vLLM stand-in: a cost model plus a real block-hashed cache simulation, served over HTTP.

Everything this package produces is simulated and says so (`x-kvscope-simulated: 1`, `/version`).
The engine (`simulator.engine.Engine`) is a pure object driven with an explicit `now`; the ASGI app
(`simulator.server`) and the process runner (`simulator.runner`) sit on top of it.
"""

EMULATED_VLLM_VERSION = "0.33.0"
SIM_HEADER = "x-kvscope-simulated"
