#!/usr/bin/env bash
# Install libiwarp (release build): the shared and static library, the
# header and a pkg-config file, `make install` style.
#
#   scripts/install-capi.sh PREFIX            # e.g. /usr/local or $HOME/.local
#   LIBDIR=/usr/lib64 INCLUDEDIR=/usr/include scripts/install-capi.sh /usr
#   DESTDIR=/tmp/stage scripts/install-capi.sh /usr   # staged (packaging)
#
# Installs $LIBDIR/libiwarp.so, $LIBDIR/libiwarp.a, $INCLUDEDIR/iwarp.h and
# $LIBDIR/pkgconfig/iwarp.pc (LIBDIR defaults to PREFIX/lib, INCLUDEDIR to
# PREFIX/include). Then: cc app.c $(pkg-config --cflags --libs iwarp).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# != 1 ]]; then
    echo "usage: $0 PREFIX" >&2
    exit 2
fi
PREFIX=$1
LIBDIR=${LIBDIR:-$PREFIX/lib}
INCLUDEDIR=${INCLUDEDIR:-$PREFIX/include}
DESTDIR=${DESTDIR:-}

cargo build -p iwarp-ffi --release
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
BUILD=$TARGET_DIR/release
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' crates/iwarp-ffi/Cargo.toml | head -1)

install -d "$DESTDIR$LIBDIR/pkgconfig" "$DESTDIR$INCLUDEDIR"
install -m 0755 "$BUILD/libiwarp.so" "$DESTDIR$LIBDIR/libiwarp.so"
install -m 0644 "$BUILD/libiwarp.a" "$DESTDIR$LIBDIR/libiwarp.a"
install -m 0644 include/iwarp.h "$DESTDIR$INCLUDEDIR/iwarp.h"
sed -e "s|@PREFIX@|$PREFIX|" -e "s|@LIBDIR@|$LIBDIR|" -e "s|@INCLUDEDIR@|$INCLUDEDIR|" \
    -e "s|@VERSION@|$VERSION|" crates/iwarp-ffi/iwarp.pc.in > "$DESTDIR$LIBDIR/pkgconfig/iwarp.pc"
chmod 0644 "$DESTDIR$LIBDIR/pkgconfig/iwarp.pc"
echo "installed libiwarp $VERSION into $DESTDIR$PREFIX"
echo "use: PKG_CONFIG_PATH=$LIBDIR/pkgconfig pkg-config --cflags --libs iwarp"
