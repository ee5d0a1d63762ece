//! The QoS policy lab of vhost-user-rdma: a scenario file names tenants,
//! VMs, weights and limits in the daemon's own configuration syntax, a
//! workload per VM (an operation at a size, depth and QP count, closed loop
//! or paced, or an attack from the catalogue, each with start and stop
//! times) and live QoS changes; the lab runs it against the real daemon in
//! this process with in-process VMs, and reports per VM and tenant
//! throughput, latency percentiles, shares against the weights and Jain's
//! fairness index, with a verdict for each expectation the scenario states.
//! docs/qos-lab.md is the guide.

pub mod plot;
pub mod record;
pub mod report;
pub mod run;
pub mod scenario;
pub mod workload;
