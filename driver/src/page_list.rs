//! Page lists of create commands (spec chapter 10): `CONTIGUOUS` when the
//! pages are consecutive, `INLINE` when the list fits the request, otherwise
//! `INDIRECT` with list pages in DMA memory.

use virtio_rdma_abi::ctrl::{RequestHeader, MAX_REQUEST_BYTES};
use virtio_rdma_abi::mem::{BufferDesc, PageListMode, LIST_PAGE_ENTRIES, LIST_PAGE_SIZE};
use virtio_rdma_abi::Field;

use crate::dma::DmaBuf;
use crate::error::{Error, Result};
use crate::transport::Transport;

/// A page list ready to go into a request.
#[derive(Debug)]
pub(crate) struct PageList {
    /// The request's `buf` field.
    pub desc: BufferDesc,
    /// Bytes following the request's fixed structure.
    pub tail: Vec<u8>,
    /// Indirect list pages; they must live until the response arrived.
    pub _list_pages: Vec<DmaBuf>,
}

/// Builds the page list of `pages` (each `1 << page_shift` bytes), for a
/// request whose fixed payload is `fixed_size` bytes.
pub(crate) fn build(
    transport: &dyn Transport,
    pages: &[u64],
    page_shift: u32,
    first_page_offset: u32,
    max_inline_pages: u32,
    fixed_size: usize,
) -> Result<PageList> {
    let npages = u32::try_from(pages.len())
        .map_err(|_| Error::InvalidArgument(format!("{} pages", pages.len())))?;
    if npages == 0 {
        return Err(Error::InvalidArgument("empty page list".into()));
    }
    let page = 1u64 << page_shift;
    let mut desc = BufferDesc {
        addr: 0,
        npages,
        first_page_offset,
        page_shift,
        mode: PageListMode::CONTIGUOUS.into(),
    };
    let contiguous = pages.iter().enumerate().all(|(i, &p)| {
        Some(p)
            == (i as u64)
                .checked_mul(page)
                .and_then(|o| o.checked_add(pages[0]))
    });
    if contiguous {
        desc.addr = pages[0];
        return Ok(PageList {
            desc,
            tail: Vec::new(),
            _list_pages: Vec::new(),
        });
    }
    let room = MAX_REQUEST_BYTES.saturating_sub(RequestHeader::SIZE + fixed_size) / 8;
    if npages <= max_inline_pages && pages.len() <= room {
        desc.mode = PageListMode::INLINE.into();
        let tail = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        return Ok(PageList {
            desc,
            tail,
            _list_pages: Vec::new(),
        });
    }
    let nlist = pages.len().div_ceil(LIST_PAGE_ENTRIES as usize);
    if nlist > room {
        return Err(Error::InvalidArgument(format!(
            "{npages} pages need {nlist} list pages, more than one request carries; use larger pages"
        )));
    }
    desc.mode = PageListMode::INDIRECT.into();
    let mut tail = Vec::with_capacity(nlist * 8);
    let mut list_pages = Vec::with_capacity(nlist);
    for chunk in pages.chunks(LIST_PAGE_ENTRIES as usize) {
        let size = LIST_PAGE_SIZE as usize;
        let lp = DmaBuf::new(transport.alloc_dma(size, size)?)?;
        let gpa = lp.gpa(0).unwrap_or(1);
        if lp.len() < size || gpa % LIST_PAGE_SIZE != 0 || lp.page_shift() < 12 {
            return Err(Error::InvalidArgument(format!(
                "transport returned a misaligned list page (gpa {gpa:#x})"
            )));
        }
        let bytes: Vec<u8> = chunk.iter().flat_map(|p| p.to_le_bytes()).collect();
        lp.write(0, &bytes)?;
        tail.extend_from_slice(&gpa.to_le_bytes());
        list_pages.push(lp);
    }
    Ok(PageList {
        desc,
        tail,
        _list_pages: list_pages,
    })
}
