"""The one secret of every authenticated test cluster (tests run authenticated, as `wansync run` does),
and another one for the tests where a peer holds the wrong secret."""

SECRET = b"wansync-test-cluster-secret-0123456789"
OTHER_SECRET = b"another-secret-entirely-0123456789"
