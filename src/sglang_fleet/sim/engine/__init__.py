"""The simulated server's processes: controller, schedulers (ranks, rendezvous, graphs,
progress bars), detokenizer, the runtime they share, and the failures injected."""
