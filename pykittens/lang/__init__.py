"""What kernel authors write: tile types, ops, control flow, scheduling and synchronisation.
`pykittens` re-exports all of it as `pk.*`; tracing turns a kernel into tile IR."""
