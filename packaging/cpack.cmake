# CPack: `cpack -G DEB` in a build tree configured with
# -DCMAKE_INSTALL_PREFIX=/usr builds thinfs_<version>-1_<arch>.deb from the
# same install() rules `cmake --install` runs. See docs/packaging.md.

set(CPACK_PACKAGE_NAME "thinfs")
set(CPACK_PACKAGE_VENDOR "thinfs developers")
set(CPACK_PACKAGE_CONTACT "thinfs developers <thinfs@localhost>")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "thin provisioning and snapshots in user space (FUSE)")
set(CPACK_PACKAGE_DESCRIPTION
    "thinfs does what Linux dm-thin does in the kernel, served through FUSE.
A pool holds one shared data area and the metadata (RocksDB and an mmapped
allocation bitmap) that maps every thin device onto it. Mounted, each device
is a sparse regular file: run losetup over it for a block device, clone it
in O(1) with cp --reflink=auto or thinfs snapshot.
.
This package holds the thinfs command, the mount.thinfs helper for
mount -t thinfs and /etc/fstab, the thinfs@.service systemd template unit,
the thinfs(8) manual page and bash completion.")
set(CPACK_GENERATOR "DEB")
set(CPACK_SOURCE_GENERATOR "TGZ")
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/build[^/]*/" "/pool/" "/vols/")
set(CPACK_STRIP_FILES ON)
# The Debian layout is absolute (/usr/bin, /lib/systemd/system, ...).
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_PROJECT_CONFIG_FILE "${CMAKE_CURRENT_BINARY_DIR}/CPackProjectConfig.cmake")
configure_file(${CMAKE_CURRENT_LIST_DIR}/CPackProjectConfig.cmake.in
               ${CPACK_PROJECT_CONFIG_FILE} @ONLY)

set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "admin")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
# dpkg-shlibdeps adds the shared libraries the binary needs (libc6 alone
# with THINFS_STATIC_DEPS, the default; otherwise libfuse3-3, Boost
# program_options, libxxhash, libexpat1, libstdc++ and RocksDB's compression
# libraries too); fuse3 is for fusermount3, which `thinfs umount` and
# non-root mounts run, and /etc/fuse.conf.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "fuse3")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "bash-completion, e2fsprogs, thin-provisioning-tools")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${CMAKE_CURRENT_LIST_DIR}/debian/postinst"
    "${CMAKE_CURRENT_LIST_DIR}/debian/prerm"
    "${CMAKE_CURRENT_LIST_DIR}/debian/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
