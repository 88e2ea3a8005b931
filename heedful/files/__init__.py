"""Files and the supply chain: where heedful keeps what it builds (:mod:`~heedful.files.cache`),
files written whole (:mod:`~heedful.files.atomic`), the pinned artefacts it fetches
(:mod:`~heedful.files.pins`) and the one module that downloads them (:mod:`~heedful.files.supply`).

These sit at the bottom of the library core: anything above may fetch or write, and nothing
here imports the engine, the adapters or the applications.
"""
