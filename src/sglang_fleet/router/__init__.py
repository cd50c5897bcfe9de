"""SGLang's router (sglang-router) on the controller: the RouterSpec (spec), its option
catalogue, the files rendered, which servers it re-adds by itself (rejoin), and its view of
each server (view). Its settings table is sglang_fleet.settings.router."""
