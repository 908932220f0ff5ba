# ATTN_CUDA_EMULATION: src/device (its backends too) and src/attn/device built as in a CUDA
# build, but on the host emulation of the CUDA runtime in this folder, with
# kernels/cuda's launchers running their kernels/cpu twins (emu_kernels.cc).
# Included from the top-level CMakeLists.txt in place of kernels/cuda/cuda.cmake.
file(GLOB ATTN_CUDA_EMU_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cc)
file(GLOB_RECURSE ATTN_DEVICE_SRC CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/device/*.cc
     ${PROJECT_SOURCE_DIR}/src/attn/device/*.cc)
# NCCL, where nccl.h is found, emulated on the same runtime (nccl/), so the
# NCCL backend (src/device/backends/nccl/nccl_comm.cc) runs too.
if(ATTN_HAVE_NCCL)
  file(GLOB ATTN_NCCL_EMU_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/nccl/*.cc)
  list(APPEND ATTN_CUDA_EMU_SRC ${ATTN_NCCL_EMU_SRC})
endif()
add_library(attncomm_cuda_obj OBJECT ${ATTN_CUDA_EMU_SRC} ${ATTN_DEVICE_SRC}
            ${PROJECT_SOURCE_DIR}/kernels/cuda/errors.cc)
target_compile_definitions(attncomm_cuda_obj PRIVATE ATTN_HAVE_CUDA=1 ATTN_HAVE_NCCL=$<BOOL:${ATTN_HAVE_NCCL}>)
target_include_directories(attncomm_cuda_obj PRIVATE
  ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include ${ATTN_CUDA_EMU_INCLUDE} ${NCCL_INCLUDE_DIR})
# The toolkit headers mark cudaGetDriverEntryPoint deprecated; we define it.
target_compile_options(attncomm_cuda_obj PRIVATE ${ATTN_WARN_FLAGS} -Wno-deprecated-declarations)
foreach(t attncomm attncomm_static)
  target_sources(${t} PRIVATE $<TARGET_OBJECTS:attncomm_cuda_obj>)
endforeach()
# The runtime is inside the library: consumers need only the headers.
add_library(attn_cudart INTERFACE)
target_include_directories(attn_cudart INTERFACE ${ATTN_CUDA_EMU_INCLUDE} ${NCCL_INCLUDE_DIR})

# The SIMT simulator (simt/): kernels/cuda's own sources compiled as host
# C++ and run on simulated GPU threads. Linked into test_cuda_kernels
# only, ahead of the library, so those tests check the real kernels while
# the rest of the emulated build keeps the fast CPU twins above. (The
# archive's emu_kernels.o defines the same launchers and is then never
# pulled in.)
set(ATTN_SIMT_KERNELS attention.cu lse.cu merge.cu pack.cu reduce.cu sinks.cu)
list(TRANSFORM ATTN_SIMT_KERNELS PREPEND ${PROJECT_SOURCE_DIR}/kernels/cuda/)
file(GLOB ATTN_SIMT_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/simt/*.cc)
set_source_files_properties(${ATTN_SIMT_KERNELS} PROPERTIES LANGUAGE CXX
  COMPILE_OPTIONS "-xc++;-include;${CMAKE_CURRENT_LIST_DIR}/simt/device_prelude.h;-Wno-unknown-pragmas")
add_library(attn_cuda_simt OBJECT ${ATTN_SIMT_KERNELS} ${ATTN_SIMT_SRC})
target_compile_definitions(attn_cuda_simt PRIVATE ATTN_HAVE_CUDA=1)
target_include_directories(attn_cuda_simt BEFORE PRIVATE ${CMAKE_CURRENT_LIST_DIR}/simt/include)
target_include_directories(attn_cuda_simt PRIVATE
  ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include ${ATTN_CUDA_EMU_INCLUDE})
target_compile_options(attn_cuda_simt PRIVATE ${ATTN_WARN_FLAGS})
