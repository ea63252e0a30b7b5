# cython: language_level=3
"""kmem's compiled core: loops over bytes and integers, no policy.

One extension module built from included parts (as msgpack and pyroaring do); the Python modules in
``kmem`` validate arguments, hold configuration and decide, and call down into these parts.
"""

include "_pool.pxi"
include "_bloom.pxi"
include "_records.pxi"
include "_search.pxi"
