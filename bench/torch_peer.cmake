# Peer-framework baseline: quiver-torch-peer, the bundled models trained with libtorch.
#
# Included by the top-level CMakeLists when QUIVER_BUILD_BENCH is ON. Optional: without
# libtorch the build goes on and says so. Sets QUIVER_TORCH_PEER_FOUND (ON/OFF).
#
# Debian's libtorch-dev installs TorchConfig.cmake under /usr/lib/<multiarch>/cmake/Torch,
# which find_package searches by default; the HINTS only make that explicit. A libtorch
# elsewhere (e.g. an unpacked pytorch.org zip) is picked up with -DTorch_DIR=<dir>/share/cmake/Torch.
# TorchConfig pulls in Caffe2Config, which needs gflags, glog and protobuf's CMake files
# (dependencies of libtorch-dev) and runs find_package(Threads).

find_package(Torch QUIET
  HINTS "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch")

if(Torch_FOUND)
  set(QUIVER_TORCH_PEER_FOUND ON)
  message(STATUS "libtorch found: peer bench enabled (${Torch_DIR})")

  add_executable(quiver-torch-peer "${PROJECT_SOURCE_DIR}/bench/torch_peer.cpp")
  # `torch` carries the include dirs and -D_GLIBCXX_USE_CXX11_ABI=1. The project's warning
  # target is deliberately not linked: libtorch's headers are not warning-clean.
  target_link_libraries(quiver-torch-peer PRIVATE torch ZLIB::ZLIB)
  target_compile_features(quiver-torch-peer PRIVATE cxx_std_20)
else()
  set(QUIVER_TORCH_PEER_FOUND OFF)
  message(STATUS "libtorch not found (apt-get install libtorch-dev): peer bench disabled")
endif()
