"""Key-value backends with etcd's semantics: a real etcd, or in memory."""
