"""The warm worker's standard-library side: where its socket lives, what the two ends say to
each other (:mod:`heedful.warm.channel`), and the command line's end of it
(:mod:`heedful.warm.client`). The worker itself is :mod:`heedful.worker` (it imports the whole
command line); the entry point that chooses between the two is :mod:`heedful.launch`.

Nothing here imports more than the standard library and :mod:`heedful.files.cache`, so that a
command forwarded to a running worker starts in a few tens of milliseconds.
"""
