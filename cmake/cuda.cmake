# CUDA backends (sm80 FlashAttention-2 design, sm90 FlashAttention-3 design). Enabled when nvcc is found
# (FLASHATTN_CUDA=AUTO) or forced; the CPU build never needs it.
include(CheckLanguage)
set(FLASHATTN_WITH_CUDA OFF)
if(NOT FLASHATTN_CUDA STREQUAL "OFF")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(FLASHATTN_WITH_CUDA ON)
  elseif(FLASHATTN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLASHATTN_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

# CuTe/CUTLASS headers: from FLASHATTN_CUTLASS_DIR, else from the pinned pip package nvidia-cutlass. Under
# AUTO a missing CUTLASS turns the CUDA backends off with a warning (so `pip install .` in an isolated build
# environment still gives a working CPU package); under ON it is an error.
set(FLASHATTN_CUTLASS_DIR "" CACHE PATH "CUTLASS include directory (holds cute/ and cutlass/)")
if(FLASHATTN_WITH_CUDA AND NOT FLASHATTN_CUTLASS_DIR)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
        "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE _cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _cutlass_rc ERROR_QUIET)
  endif()
  if(_cutlass_rc EQUAL 0 AND EXISTS "${_cutlass_inc}/cute/tensor.hpp")
    set(FLASHATTN_CUTLASS_DIR "${_cutlass_inc}" CACHE PATH "" FORCE)
  elseif(FLASHATTN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CUTLASS headers not found: pip install --no-deps nvidia-cutlass==4.2.0.0 "
                        "or set FLASHATTN_CUTLASS_DIR")
  else()
    message(WARNING "flashattn: nvcc found but no CUTLASS headers (pip install --no-deps nvidia-cutlass==4.2.0.0, "
                    "or -DFLASHATTN_CUTLASS_DIR=...): building without the CUDA backends")
    set(FLASHATTN_WITH_CUDA OFF)
  endif()
endif()

if(FLASHATTN_WITH_CUDA)
  # Each kernel family sets its own architectures on its targets (FLASHATTN_SM80_ARCHS below); the global
  # default only has to be something this CMake accepts, so the "a" (arch-specific) suffix, which CMake
  # 3.25 does not know, is stripped here and the Hopper family passes its gencode flags itself.
  string(REGEX REPLACE "([0-9]+)a" "\\1" _fa_plain_archs "${FLASHATTN_CUDA_ARCHS}")
  set(CMAKE_CUDA_ARCHITECTURES ${_fa_plain_archs})
  # The FlashAttention-2 family (mma.sync, cp.async) runs on sm80 and later; it is also compiled for sm90
  # so that Hopper runs native code rather than JIT-compiled PTX.
  set(FLASHATTN_SM80_ARCHS "80;90" CACHE STRING "CUDA architectures of the sm80 (FlashAttention-2) kernels")
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  # The host compiler's warnings on the host side of the .cu units, as on the .cpp units (FA_CPU_WARN); the
  # CuTe/CUTLASS headers are SYSTEM includes everywhere, so their warnings stay out.
  set(FA_CUDA_WARN $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)

  message(STATUS "flashattn: CUDA backends ON (archs ${CMAKE_CUDA_ARCHITECTURES}, kernels ${FLASHATTN_KERNELS}, "
                 "CUTLASS ${FLASHATTN_CUTLASS_DIR})")

  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/CMakeLists.txt)
    add_subdirectory(src/cuda)
  endif()
else()
  message(STATUS "flashattn: CUDA backends OFF (CPU only)")
endif()
