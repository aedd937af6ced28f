//! Every control of a test backend, exercised with real tonic clients over real sockets.

mod counters;
mod faults;
mod health;
mod lifecycle;
mod ping_guard;
mod server_options;
mod support;
