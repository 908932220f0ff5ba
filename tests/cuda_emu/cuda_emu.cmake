# ATTN_CUDA_EMULATION: src/device and transports/cuda_ipc built as in a CUDA
# build, but on the host emulation of the CUDA runtime in this folder, with
# kernels/cuda's launchers running their kernels/cpu twins (emu_kernels.cc).
# Included from the top-level CMakeLists.txt in place of kernels/cuda/cuda.cmake.
file(GLOB ATTN_CUDA_EMU_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cc)
file(GLOB ATTN_DEVICE_SRC CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/device/*.cc
     ${PROJECT_SOURCE_DIR}/transports/cuda_ipc/*.cc)
add_library(attncomm_cuda_obj OBJECT ${ATTN_CUDA_EMU_SRC} ${ATTN_DEVICE_SRC}
            ${PROJECT_SOURCE_DIR}/kernels/cuda/errors.cc)
target_compile_definitions(attncomm_cuda_obj PRIVATE ATTN_HAVE_CUDA=1 ATTN_HAVE_NCCL=0)
target_include_directories(attncomm_cuda_obj PRIVATE
  ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include ${ATTN_CUDA_EMU_INCLUDE})
# The toolkit headers mark cudaGetDriverEntryPoint deprecated; we define it.
target_compile_options(attncomm_cuda_obj PRIVATE ${ATTN_WARN_FLAGS} -Wno-deprecated-declarations)
foreach(t attncomm attncomm_static)
  target_sources(${t} PRIVATE $<TARGET_OBJECTS:attncomm_cuda_obj>)
endforeach()
# The runtime is inside the library: consumers need only the headers.
add_library(attn_cudart INTERFACE)
target_include_directories(attn_cudart INTERFACE ${ATTN_CUDA_EMU_INCLUDE})
