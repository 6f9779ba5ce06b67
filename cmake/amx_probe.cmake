# Intel AMX and fastspec.
#
# ggml compiles its AMX matmul whenever the compiler's -march=native turns AMX on, and
# then its "AMX" buffer type takes every weight it has kernels for (Q4_0, Q4_K, Q6_K ...)
# away from the CPU backend's repacked layouts, and with them from the verification kernels
# fastspec's patches add (patches/).  Measured on a 2-core Emerald Rapids (family 6 model
# 207, sixty-seventh session; `bench/verify_cost.py --cores` with a build of each, the
# default target, 2 threads, passes alternated): one token 66.7 -> 86.6 ms, 2/3/4 tokens
# 71/77/80 -> 148/153/158 ms, 8 tokens 135 -> 189 ms; 16 tokens 264 -> 243 ms and 64 tokens
# 1244 -> 849 ms.  Prompts read faster; everything speculative decoding does (one-token
# passes, short verification batches) runs slower.  So fastspec builds ggml without AMX
# (-march=native minus -mamx-*: AVX-512, VNNI, BF16 ... stay on) unless asked to keep it
# with FASTSPEC_AMX=ON.
#
# Asked for, AMX is kept only where a small AMX program, written and built the way ggml's
# is (a zeroed tile config filled field by field, -march=native -O2), runs here.  It fails
# on machines (often virtual ones) that advertise AMX while the OS or hypervisor has not
# enabled the tile state, and with GCC 12, whose _tile_loadconfig tells the optimizer it
# reads 8 bytes of the 64-byte config: the row counts and widths stored before it are
# dropped as dead stores, the tiles stay unconfigured and the first tile instruction raises
# SIGILL (ggml's ggml_tile_config_init, Debian's GCC 12.2, the same machine).  Either way
# the build falls back to no AMX and says why.  FASTSPEC_AMX_KEPT (ON/OFF) tells the rest
# of CMakeLists.txt what was decided (fastspec._core.amx_kept()).

function(fastspec_choose_amx)
  set(FASTSPEC_AMX_KEPT OFF PARENT_SCOPE)
  if(NOT GGML_NATIVE OR MSVC
     OR NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i686)$")
    return()
  endif()
  set(_dir "${CMAKE_BINARY_DIR}/amx_probe")
  file(WRITE "${_dir}/native.c" [=[
#ifndef __AMX_TILE__
#error "-march=native does not enable AMX here"
#endif
int main(void) { return 0; }
]=])
  try_compile(_native_amx "${_dir}/native"
    SOURCES "${_dir}/native.c"
    COMPILE_DEFINITIONS -march=native)
  if(NOT _native_amx)
    return()    # nothing to switch off
  endif()
  set(_keep OFF)
  set(_why "kept only with FASTSPEC_AMX=ON: its kernels replace fastspec's verification kernels, slower for speculative decoding")
  if(FASTSPEC_AMX AND CMAKE_CROSSCOMPILING)
    set(_keep ON)
  elseif(FASTSPEC_AMX)
    file(WRITE "${_dir}/probe.c" [=[
#include <stdint.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
struct tilecfg { uint8_t palette, start; uint8_t pad[14]; uint16_t colsb[16]; uint8_t rows[16]; };
/* configured as ggml_tile_config_init does: a zeroed config filled field by field */
__attribute__((noinline)) static void configure(void) {
    _Alignas(64) struct tilecfg cfg = {0};
    cfg.palette = 1;
    cfg.rows[0] = 16; cfg.colsb[0] = 64;
    _tile_loadconfig(&cfg);
}
int main(void) {
#if defined(__linux__)
    /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: what ggml asks for too */
    syscall(SYS_arch_prctl, 0x1023, 18);
#endif
    configure();
    _tile_zero(0);
    _tile_release();
    return 0;
}
]=])
    try_run(_run_rc _compiled "${_dir}/run" "${_dir}/probe.c"
      COMPILE_DEFINITIONS -march=native -O2)
    if(_compiled AND "${_run_rc}" STREQUAL "0")
      set(_keep ON)
    else()
      set(_why "FASTSPEC_AMX=ON, but an AMX program built like ggml's does not run here (probe exit: ${_run_rc}): the CPU's tile state is off, or the compiler drops the tile config's stores (GCC 12)")
    endif()
  endif()
  if(_keep)
    message(STATUS "fastspec: keeping Intel AMX (FASTSPEC_AMX=ON)")
    set(FASTSPEC_AMX_KEPT ON PARENT_SCOPE)
  else()
    message(STATUS "fastspec: building ggml with -march=native minus AMX (${_why})")
    set(CMAKE_C_FLAGS "${CMAKE_C_FLAGS} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" PARENT_SCOPE)
    set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" PARENT_SCOPE)
  endif()
endfunction()
