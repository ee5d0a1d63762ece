//! Delivering asynchronous events: queued events go into the buffers the
//! driver posted on the event queue.

use std::io;

use log::{debug, warn};
use vhost_user_backend::VringT;
use virtio_queue::{DescriptorChain, QueueT};
use virtio_rdma_abi::event::Event;
use virtio_rdma_abi::{Field, Wire};
use vm_memory::GuestMemoryBackend;

use crate::vring::Vring;

use super::controlq::scatter;
use super::{signal, Mem, RdmaDevice};

impl RdmaDevice {
    pub(super) fn deliver_events(&self, vring: &Vring, mem: &Mem) -> io::Result<()> {
        if !vring.get_ref().is_enabled() {
            return Ok(());
        }
        let mut st = self.lock();
        let mut delivered = false;
        let mut rechecked = false;
        while let Some(ev) = st.vm.events.pop() {
            // Bind first: the queue guard must be gone before the arms
            // below touch the vring again.
            let next = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone());
            let chain = match next {
                Some(c) => c,
                None => {
                    st.vm.events.unpop(ev);
                    // Out of buffers with events waiting: ask to be kicked
                    // when the driver posts more (with EVENT_IDX the driver
                    // only kicks past the index we publish here). If some
                    // arrived meanwhile, go round again.
                    // Only once: a stopped queue can show new avail
                    // entries it will not hand out, and this loop holds
                    // the state lock the engine needs.
                    if !rechecked && vring.enable_notification().map_err(io::Error::other)? {
                        rechecked = true;
                        continue;
                    }
                    break;
                }
            };
            rechecked = false;
            let head = chain.head_index();
            if head >= vring.get_ref().get_queue().size() {
                // Names no buffer, and cannot be returned (spec 7.4, 14.1).
                debug!("event queue: available head {head} is not a descriptor");
                st.vm.count_malformed();
                st.vm.events.unpop(ev);
                continue;
            }
            let used = if write_event(mem, chain, &ev) {
                Event::SIZE as u32
            } else {
                // Unusable buffer: give it back empty and keep the event.
                st.vm.count_malformed();
                st.vm.events.unpop(ev);
                0
            };
            if let Err(e) = vring.add_used(head, used) {
                warn!("cannot return event buffer {head}: {e}");
            }
            delivered = true;
        }
        drop(st);
        if delivered {
            signal(vring)?;
        }
        Ok(())
    }
}
fn write_event(mem: &Mem, chain: DescriptorChain<Mem>, ev: &Event) -> bool {
    let mut writable = Vec::new();
    let mut total = 0usize;
    let mut truncated = false;
    for desc in chain {
        truncated = desc.has_next();
        // Ignored like an empty descriptor of a control request (spec 14.1).
        if desc.len() == 0 {
            continue;
        }
        if !desc.is_write_only() {
            return false;
        }
        total = total.saturating_add(desc.len() as usize);
        writable.push((desc.addr(), desc.len() as usize));
    }
    if truncated || total < Event::SIZE || writable.iter().any(|&(a, l)| !mem.check_range(a, l)) {
        return false;
    }
    scatter(mem, &writable, &ev.to_bytes()) as usize == Event::SIZE
}
