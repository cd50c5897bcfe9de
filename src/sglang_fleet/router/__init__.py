"""SGLang's router (sglang-router) on the controller: its settings table, the RouterSpec, its
option catalogue, the files rendered, which servers it re-adds, its view of each server."""
