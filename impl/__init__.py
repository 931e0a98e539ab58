"""The server code under test: an NGRAM speculative-decoding engine with an overlap
scheduler, the FutureMap accept relay and grammar-constrained verify.

It reads like the server code it mirrors: it takes a ``device`` and reaches streams and
events through ``torch.get_device_module(device)``; it imports nothing from the harness
but the fault-point hook (``seams.faults``).
"""
