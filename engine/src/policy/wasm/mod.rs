//! WebAssembly policy host. (Stub: filled in by the policy-host work.)
