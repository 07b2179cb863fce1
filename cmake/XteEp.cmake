# Expert parallelism: the core (src/ep/*.c) and its transports (src/ep/transport/): the threads
# transport always; the MPI transport when CMake finds MPI (Debian: openmpi-bin libopenmpi-dev),
# else a stand-in that says so.
# XTE_MPI=OFF builds without MPI even where it is installed.
option(XTE_MPI "Build the MPI transport of expert parallelism when MPI is found" ON)
set(XTE_HAVE_MPI OFF)
if(XTE_MPI)
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(XTE_HAVE_MPI ON)
  endif()
endif()
file(GLOB XTE_EP_CORE_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/ep/*.c)
target_sources(xte PRIVATE ${XTE_EP_CORE_SRC} ${CMAKE_CURRENT_SOURCE_DIR}/src/ep/transport/threads.c)
if(XTE_HAVE_MPI)
  target_sources(xte PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/ep/transport/mpi.c)
  target_link_libraries(xte PRIVATE MPI::MPI_C)
  target_compile_definitions(xte PRIVATE XTE_HAVE_MPI)
  message(STATUS "xte: expert parallelism over MPI ${MPI_C_VERSION} (${MPIEXEC_EXECUTABLE})")
else()
  target_sources(xte PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/ep/transport/no_mpi.c)
  message(STATUS "xte: expert parallelism without MPI (threads transport only)")
endif()
