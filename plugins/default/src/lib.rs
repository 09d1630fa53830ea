//! The default resume policy (stub).
