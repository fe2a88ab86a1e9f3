//! Parity with kube-proxy where users notice.
