"""Array frontends chosen by the type of the arrays passed to a kernel, each imported lazily
(registry.py: the protocol and the order)."""
