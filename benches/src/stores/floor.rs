//! The physical floor of an append.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::AppendStore;

/// The least an append can cost: copy the payload into a preallocated
/// buffer and publish it with one `AtomicU64::store(Release)`. No lookup,
/// no claim, no header, no metrics. Each writer owns its buffer (8 KiB,
/// like a Rewind session arena in these benches), so there is no "same
/// session" floor: two writers on one buffer would first need a claim,
/// which is exactly the cost the floor leaves out.
#[derive(Debug, Default)]
pub struct FloorStore;

/// One writer's buffer and its publication word.
#[derive(Debug)]
pub struct FloorWriter {
    buf: Box<[u8]>,
    pos: usize,
    seq: u64,
    published: Box<Padded>,
}

/// The publication word on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl AppendStore for FloorStore {
    type Writer = FloorWriter;
    const NAME: &'static str = "Floor";

    fn open(&self) -> FloorWriter {
        FloorWriter {
            buf: vec![0; 8192].into_boxed_slice(),
            pos: 0,
            seq: 0,
            published: Box::default(),
        }
    }

    #[inline]
    fn append(&self, w: &mut FloorWriter, payload: &[u8]) {
        if w.pos + payload.len() > w.buf.len() {
            w.pos = 0;
        }
        w.buf[w.pos..w.pos + payload.len()].copy_from_slice(payload);
        // Keeps the copy: nothing else ever reads the buffer.
        std::hint::black_box(&mut *w.buf);
        w.pos += payload.len();
        w.seq += 1;
        w.published.0.store(w.seq, Ordering::Release);
    }
}
