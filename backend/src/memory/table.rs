//! Which memory tables the daemon accepts (spec 19.6.1).
//!
//! The daemon maps every region of a VMM's `SET_MEM_TABLE` shared. A byte
//! of such a mapping that lies past the end of its file raises `SIGBUS` in
//! the thread that touches it, which kills the whole daemon and every VM it
//! serves. So before a table is used, each region must lie inside its file
//! (mmap offset + size, without overflow), and the file must be unable to
//! shrink later: it must carry `F_SEAL_SHRINK`, as QEMU's
//! `memory-backend-memfd` files do. Files that cannot be sealed (hugetlbfs
//! or tmpfs files of `memory-backend-file`) are refused unless the operator
//! trusts the VMMs (`allow_unsealed_memory`): such a VMM can still crash the
//! daemon by truncating its file.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use thiserror::Error;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::GuestRam;

/// Why a memory table is refused.
#[derive(Debug, Error)]
pub enum TableError {
    /// The region's file cannot be examined.
    #[error("region {region}: cannot stat its file: {source}")]
    Stat {
        /// Index of the region in the table.
        region: usize,
        /// Why.
        source: io::Error,
    },
    /// The region's file is not a regular file (its size means nothing).
    #[error("region {region}: its file is not a regular file (memfd, tmpfs or hugetlbfs)")]
    NotRegular {
        /// Index of the region in the table.
        region: usize,
    },
    /// The region runs past the end of its file (or its end overflows).
    #[error(
        "region {region}: mmap offset {offset:#x} + size {size:#x} is past the end of its \
         {file_size:#x}-byte file"
    )]
    PastEnd {
        /// Index of the region in the table.
        region: usize,
        /// The region's mmap offset.
        offset: u64,
        /// The region's size.
        size: u64,
        /// The file's size.
        file_size: u64,
    },
    /// The file may shrink under the mapping.
    #[error(
        "region {region}: its file is not sealed against shrinking (F_SEAL_SHRINK); use a \
         sealed memfd (QEMU memory-backend-memfd) or allow_unsealed_memory"
    )]
    Unsealed {
        /// Index of the region in the table.
        region: usize,
    },
}

/// Checks one region of a memory table: `[offset, offset + size)` of
/// `file`, region number `region` (for the error).
pub fn check_region_file(
    region: usize,
    file: &File,
    offset: u64,
    size: u64,
    allow_unsealed: bool,
) -> Result<(), TableError> {
    let meta = file
        .metadata()
        .map_err(|source| TableError::Stat { region, source })?;
    if !meta.file_type().is_file() {
        return Err(TableError::NotRegular { region });
    }
    let file_size = meta.len();
    let past_end = TableError::PastEnd {
        region,
        offset,
        size,
        file_size,
    };
    match offset.checked_add(size) {
        Some(end) if end <= file_size => {}
        _ => return Err(past_end),
    }
    if !allow_unsealed && !shrink_sealed(file) {
        return Err(TableError::Unsealed { region });
    }
    Ok(())
}

/// Whether `file` carries `F_SEAL_SHRINK` (a file that does not support
/// seals does not).
pub(crate) fn shrink_sealed(file: &File) -> bool {
    // SAFETY: F_GET_SEALS reads the seals of a descriptor we own for the
    // call; it touches no memory of ours.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// Checks every region of a table the vhost-user library mapped. A region
/// without a file (not from a VMM) cannot change under the mapping.
pub fn check_table(mem: &GuestRam, allow_unsealed: bool) -> Result<(), TableError> {
    for (i, r) in mem.iter().enumerate() {
        if let Some(fo) = r.file_offset() {
            check_region_file(i, fo.file(), fo.start(), r.len(), allow_unsealed)?;
        }
    }
    Ok(())
}

/// Whether `new` maps exactly the memory `current` maps: as many regions,
/// each at the same guest-physical address with the same size, the same
/// protection and flags, over the same file (device and inode: the
/// descriptors differ, each `SET_MEM_TABLE` sends its own) at the same
/// offset. A VMM sends its table again at every start of the device (QEMU
/// after each reset of the guest, or of the device by its driver); the
/// mapping in use then serves on, and the new one is dropped untouched. A
/// region without a file (not from a VMM) is never the same memory; an
/// empty table maps nothing to keep.
///
/// Keeping the old mapping for the new table is sound because both map the
/// same bytes of the same file shared: what the VMM or guest writes through
/// one is what the daemon reads through the other. The checks of the new
/// table ([`check_table`]) still apply: they look at the file as it is now,
/// the same file the old mapping maps.
pub fn same_mapping(current: &GuestRam, new: &GuestRam) -> bool {
    use std::os::unix::fs::MetadataExt;
    let identity = |f: &File| f.metadata().ok().map(|m| (m.dev(), m.ino()));
    current.num_regions() > 0
        && current.num_regions() == new.num_regions()
        && current.iter().zip(new.iter()).all(|(a, b)| {
            let (Some(fa), Some(fb)) = (a.file_offset(), b.file_offset()) else {
                return false;
            };
            a.start_addr() == b.start_addr()
                && a.len() == b.len()
                && a.prot() == b.prot()
                && a.flags() == b.flags()
                && fa.start() == fb.start()
                && identity(fa.file()).is_some_and(|i| Some(i) == identity(fb.file()))
        })
}

#[cfg(test)]
pub(in crate::memory) mod tests {
    use super::*;

    /// A memfd of `size` bytes with `seals` (shared with the log's tests).
    pub(in crate::memory) fn memfd(size: u64, seals: libc::c_int) -> File {
        use std::os::fd::FromRawFd;
        // SAFETY: a valid NUL-terminated name; the call touches no memory.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(size).unwrap();
        if seals != 0 {
            // SAFETY: as above, on a descriptor we own.
            assert_eq!(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }, 0);
        }
        f
    }

    #[test]
    fn regions_must_fit_their_file() {
        let f = memfd(1 << 22, libc::F_SEAL_SHRINK);
        check_region_file(0, &f, 0, 1 << 22, false).unwrap();
        check_region_file(0, &f, 1 << 21, 1 << 21, false).unwrap();
        assert!(matches!(
            check_region_file(1, &f, 0, 1 << 30, false),
            Err(TableError::PastEnd { region: 1, .. })
        ));
        assert!(matches!(
            check_region_file(0, &f, 4096, 1 << 22, false),
            Err(TableError::PastEnd { .. })
        ));
        assert!(matches!(
            check_region_file(0, &f, u64::MAX - 4095, 8192, false),
            Err(TableError::PastEnd { .. })
        ));
    }

    /// A table of regions (gpa, size, file, offset).
    fn table(regions: &[(u64, usize, &File, u64)]) -> GuestRam {
        use vm_memory::{FileOffset, GuestAddress};
        GuestRam::from_ranges_with_files(regions.iter().map(|&(gpa, size, f, off)| {
            (
                GuestAddress(gpa),
                size,
                Some(FileOffset::new(f.try_clone().unwrap(), off)),
            )
        }))
        .unwrap()
    }

    #[test]
    fn a_table_sent_again_is_the_same_mapping_and_any_change_is_not() {
        let f = memfd(1 << 22, libc::F_SEAL_SHRINK);
        let g = memfd(1 << 22, libc::F_SEAL_SHRINK);
        let two =
            |f0: &File, off1: u64| table(&[(0, 1 << 20, f0, 0), (1 << 32, 1 << 20, &f, off1)]);
        let current = two(&f, 1 << 20);
        // The same files through other descriptors (as a new SET_MEM_TABLE
        // brings them), and through another open file of the same memfd.
        assert!(same_mapping(&current, &two(&f, 1 << 20)));
        let reopened = File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .unwrap();
        assert!(same_mapping(&current, &two(&reopened, 1 << 20)));
        // Another file, another offset, address, size, region count.
        assert!(!same_mapping(&current, &two(&g, 1 << 20)));
        assert!(!same_mapping(&current, &two(&f, 1 << 21)));
        assert!(!same_mapping(
            &current,
            &table(&[(0, 1 << 20, &f, 0), (2 << 32, 1 << 20, &f, 1 << 20)])
        ));
        assert!(!same_mapping(
            &current,
            &table(&[(0, 1 << 20, &f, 0), (1 << 32, 2 << 20, &f, 1 << 20)])
        ));
        assert!(!same_mapping(&current, &table(&[(0, 1 << 20, &f, 0)])));
        // Nothing mapped, or memory without a file: nothing to keep.
        let empty = GuestRam::new();
        assert!(!same_mapping(&empty, &empty));
        assert!(!same_mapping(&empty, &current));
        let anon = GuestRam::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).unwrap();
        assert!(!same_mapping(&anon, &anon.clone()));
    }

    #[test]
    fn files_must_be_sealed_against_shrinking() {
        let f = memfd(1 << 20, 0);
        assert!(matches!(
            check_region_file(0, &f, 0, 4096, false),
            Err(TableError::Unsealed { .. })
        ));
        check_region_file(0, &f, 0, 4096, true).unwrap();
        // Sealed against growing only: still refused.
        let g = memfd(1 << 20, libc::F_SEAL_GROW);
        assert!(check_region_file(0, &g, 0, 4096, false).is_err());
    }
}
