# Some x86 CPUs (often virtual machines) advertise Intel AMX in CPUID while the
# operating system or hypervisor has not enabled the tile state: an AMX
# instruction then raises SIGILL.  ggml compiles its AMX matmul whenever the
# compiler's -march=native turns AMX on, so such a machine builds a library that
# dies on the first decode.
#
# fastspec_disable_faulting_amx() keeps -march=native (AVX-512, VNNI, BF16 ...
# stay on) and only switches AMX off, and only when a tiny AMX program built
# with the same flags does not run here.  Set FASTSPEC_AMX=ON or OFF to skip
# the probe.

function(fastspec_disable_faulting_amx)
  if(DEFINED FASTSPEC_AMX)
    set(_amx "${FASTSPEC_AMX}")
  elseif(NOT GGML_NATIVE OR CMAKE_CROSSCOMPILING OR MSVC
         OR NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i686)$")
    return()
  else()
    set(_dir "${CMAKE_BINARY_DIR}/amx_probe")
    file(WRITE "${_dir}/probe.c" [=[
#include <stdint.h>
#include <string.h>
#ifndef __AMX_TILE__
#error "-march=native does not enable AMX here"
#endif
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
struct tilecfg { uint8_t palette, start; uint8_t pad[14]; uint16_t colsb[16]; uint8_t rows[16]; };
int main(void) {
#if defined(__linux__)
    /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: what ggml asks for too */
    syscall(SYS_arch_prctl, 0x1023, 18);
#endif
    struct tilecfg cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1; cfg.rows[0] = 1; cfg.colsb[0] = 4;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
]=])
    try_compile(_compiles "${_dir}/build"
      SOURCES "${_dir}/probe.c"
      COMPILE_DEFINITIONS -march=native)
    if(NOT _compiles)
      message(STATUS "fastspec: -march=native does not enable AMX on this compiler/CPU: nothing to do")
      return()
    endif()
    try_run(_run_rc _compiled "${_dir}/run" "${_dir}/probe.c"
      COMPILE_DEFINITIONS -march=native)
    if(_compiled AND "${_run_rc}" STREQUAL "0")
      set(_amx ON)
    else()
      set(_amx OFF)
      message(STATUS "fastspec: this CPU advertises AMX but an AMX instruction faults (probe exit: ${_run_rc})")
    endif()
  endif()
  if(NOT _amx)
    message(STATUS "fastspec: building ggml with -march=native minus AMX (-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)")
    set(CMAKE_C_FLAGS "${CMAKE_C_FLAGS} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" PARENT_SCOPE)
    set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" PARENT_SCOPE)
  else()
    message(STATUS "fastspec: AMX works on this CPU; keeping it")
  endif()
endfunction()
