// What every AMX kernel here needs (paged attention's bf16 blocks, the blocked linear's int8
// tiles): the process's permission to use the tile state, and the LDTILECFG layout.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace radixserve_cpu {

// Linux grants a process the tile state only after arch_prctl(ARCH_REQ_XCOMP_PERM); asked once.
inline bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

// A kernel's tile layout, kept as a constant in memory: GCC 12 dropped the stores into a local
// config whose only reader is LDTILECFG (the instruction then faulted on an all-zero layout).
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

}  // namespace radixserve_cpu
#endif
