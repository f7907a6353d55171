//! wanem: a packet-level WAN path emulator between two network namespaces.
//!
//! Design (mahimahi's, Netravali et al., USENIX ATC 2015): two namespaces,
//! each with one TUN device; the emulator reads every IP packet one side's
//! kernel sends, passes it through one [`pipe::Pipe`] per direction (loss,
//! drop-tail byte queue, rate limiter, delay line) and writes it into the
//! other side's TUN at its release time. Both kernels' TCP stacks see the
//! path end to end: nothing is terminated or re-segmented. TUN devices are
//! opened with IFF_NO_PI and without IFF_VNET_HDR, so the kernel segments
//! before handing packets over and each packet is at most one MTU: loss
//! applies to wire packets, never to 64 KiB GSO blobs.
//!
//! The modules below `run` and `sys` are sans-IO and deterministic: they
//! take time as nanoseconds and randomness from a seeded [`rng::Rng`], and
//! are unit-tested on their own (quinn-proto's split).

pub mod config;
pub mod delay;
pub mod link;
pub mod loss;
pub mod packet;
pub mod pipe;
pub mod rng;
pub mod run;
pub mod sys;
pub mod units;
