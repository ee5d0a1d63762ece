/*
 * uio-dma: checks, inside the test guest, the path a userspace virtio-pci driver takes:
 * a PCI function bound to uio_pci_generic, its BAR mapped through sysfs resourceN (needs
 * iomem=relaxed), DMA memory from a 2 MiB hugepage whose guest-physical address comes from
 * /proc/self/pagemap, bus mastering enabled. The device is QEMU's "edu" (1234:11e8), whose
 * DMA engine copies between guest RAM and a 4 KiB buffer inside the device.
 *
 *   QEMU: -device edu,dma_mask=0xffffffffffffffff   guest: uio-dma 0000:00:03.0
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EDU_ID 0x00
#define EDU_DMA_SRC 0x80
#define EDU_DMA_DST 0x88
#define EDU_DMA_CNT 0x90
#define EDU_DMA_CMD 0x98
#define EDU_BUF 0x40000 /* the device's buffer, in the DMA engine's address space */
#define CMD_START 1
#define CMD_TO_RAM 2
#define HUGE (2u << 20)

static volatile uint8_t *bar;

static void w64(unsigned off, uint64_t v) { *(volatile uint64_t *)(bar + off) = v; }
static uint64_t r64(unsigned off) { return *(volatile uint64_t *)(bar + off); }
static uint32_t r32(unsigned off) { return *(volatile uint32_t *)(bar + off); }

static int fail(const char *what) {
  fprintf(stderr, "uio-dma: %s: %s\n", what, strerror(errno));
  return 1;
}

/* Guest-physical address of a (present) virtual address, from /proc/self/pagemap. */
static uint64_t virt_to_phys(const void *va) {
  uint64_t ent = 0;
  long ps = sysconf(_SC_PAGESIZE);
  int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0 || pread(fd, &ent, 8, (off_t)((uintptr_t)va / ps) * 8) != 8) return 0;
  close(fd);
  if (!(ent >> 63) || !(ent & ((1ull << 55) - 1))) return 0; /* not present, or PFN hidden */
  return (ent & ((1ull << 55) - 1)) * ps + (uintptr_t)va % ps;
}

static int dma(uint64_t src, uint64_t dst, uint64_t len, uint64_t cmd) {
  w64(EDU_DMA_SRC, src);
  w64(EDU_DMA_DST, dst);
  w64(EDU_DMA_CNT, len);
  w64(EDU_DMA_CMD, cmd | CMD_START);
  for (int i = 0; i < 5000; i++) { /* the engine completes after a 100 ms timer */
    if (!(r64(EDU_DMA_CMD) & CMD_START)) return 0;
    usleep(1000);
  }
  errno = ETIMEDOUT;
  return -1;
}

int main(int argc, char **argv) {
  char path[256];
  if (argc != 2) {
    fprintf(stderr, "usage: uio-dma PCI-ADDRESS (bound to uio_pci_generic)\n");
    return 2;
  }
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/resource0", argv[1]);
  int fd = open(path, O_RDWR | O_SYNC);
  if (fd < 0) return fail(path);
  bar = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (bar == MAP_FAILED) return fail("mmap BAR0 (booted without iomem=relaxed?)");
  printf("BAR0 mapped; id register 0x%08" PRIx32 "\n", r32(EDU_ID));
  if ((r32(EDU_ID) & 0xff) != 0xed) { fprintf(stderr, "uio-dma: not an edu device\n"); return 1; }

  uint8_t *mem = mmap(NULL, HUGE, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE | MAP_LOCKED, -1, 0);
  if (mem == MAP_FAILED) return fail("mmap 2 MiB hugepage (no hugepages reserved?)");
  uint64_t pa = virt_to_phys(mem);
  if (!pa) return fail("virt_to_phys");
  printf("hugepage va %p -> guest-physical 0x%" PRIx64 " (2 MiB aligned: %s)\n", (void *)mem, pa,
         pa % HUGE ? "no" : "yes");
  if (virt_to_phys(mem + HUGE - 4096) != pa + HUGE - 4096) {
    fprintf(stderr, "uio-dma: hugepage not physically contiguous\n");
    return 1;
  }

  for (unsigned i = 0; i < 4096; i++) mem[i] = (uint8_t)(i * 7 + 1);
  memset(mem + 8192, 0, 4096);
  if (dma(pa, EDU_BUF, 4096, 0) || dma(EDU_BUF, pa + 8192, 4096, CMD_TO_RAM))
    return fail("DMA");
  if (memcmp(mem, mem + 8192, 4096)) {
    fprintf(stderr, "uio-dma: data came back different\n");
    return 1;
  }
  printf("DMA RAM -> device -> RAM of 4096 bytes at guest-physical 0x%" PRIx64 ": OK\n", pa);
  return 0;
}
