# kernels/cuda: device kernels, built only when CUDA was found
# (ATTN_HAVE_CUDA). Included from the top-level CMakeLists.txt, because
# enable_language(CUDA) must run in the top directory.
#
# Architectures: SASS for Ampere (sm_80, also runs on sm_86/89) and Hopper
# (sm_90a), plus compute_90 PTX that the driver JIT-compiles for newer GPUs.
# Every kernel needs sm_80+ (bf16 tensor cores, cp.async). Override with
# -DATTN_CUDA_ARCHS=... (e.g. "90a-real" alone halves the compile time).
set(ATTN_CUDA_ARCHS "80-real;90a-real;90-virtual" CACHE STRING
    "CUDA architectures for kernels/cuda (CMake CUDA_ARCHITECTURES syntax)")
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES ${ATTN_CUDA_ARCHS})
endif()
enable_language(CUDA)

file(GLOB ATTN_CUDA_SRC CONFIGURE_DEPENDS
     ${CMAKE_CURRENT_LIST_DIR}/*.cu ${CMAKE_CURRENT_LIST_DIR}/*.cc)
# src/device (device communicators: backends, stream bridge) and src/attn/device
# (the GPU side of the attention algorithms): host C++ on the CUDA runtime,
# built with the kernels because it needs the same runtime.
file(GLOB_RECURSE ATTN_DEVICE_SRC CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/device/*.cc
     ${PROJECT_SOURCE_DIR}/src/attn/device/*.cc)
add_library(attncomm_cuda_obj OBJECT ${ATTN_CUDA_SRC} ${ATTN_DEVICE_SRC})
target_compile_definitions(attncomm_cuda_obj PRIVATE ATTN_HAVE_CUDA=1)
set_target_properties(attncomm_cuda_obj PROPERTIES
  CUDA_ARCHITECTURES "${ATTN_CUDA_ARCHS}"
  CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
  CUDA_SEPARABLE_COMPILATION OFF)
target_include_directories(attncomm_cuda_obj PRIVATE
  ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
# CUDA::cudart_static: like NCCL, the library carries its own runtime, so it
# does not pin the application to one libcudart.so version; streams and
# device pointers are driver objects and cross runtimes freely.
target_link_libraries(attncomm_cuda_obj PUBLIC CUDA::cudart_static)
target_compile_options(attncomm_cuda_obj PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:${ATTN_WARN_FLAGS} -fvisibility=hidden>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-fvisibility=hidden
                             --expt-relaxed-constexpr>)
if(ATTN_CUDA_PTXAS_VERBOSE)  # -DATTN_CUDA_PTXAS_VERBOSE=ON: registers / spills per kernel
  target_compile_options(attncomm_cuda_obj PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
endif()

# The libraries were made before CUDA was enabled, so they did not inherit
# these; the Makefile generator checks them when CUDA objects join a target
# (Ninja does not), and would stop at "CUDA_ARCHITECTURES is empty" and at a
# CUDA dialect taken from the C++ one (CUDA20, which nvcc's CMake support
# does not know).
foreach(t attncomm attncomm_static)
  target_sources(${t} PRIVATE $<TARGET_OBJECTS:attncomm_cuda_obj>)
  target_link_libraries(${t} PRIVATE CUDA::cudart_static)
  set_target_properties(${t} PROPERTIES CUDA_ARCHITECTURES "${ATTN_CUDA_ARCHS}"
                                        CUDA_STANDARD 17)
endforeach()
