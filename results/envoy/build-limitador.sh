#!/usr/bin/env bash
# Builds limitador-server (the peer RLS in bench.sh) from a checkout of its public source, for
# measurement only: nothing of it enters this repository. Usage:
#   results/envoy/build-limitador.sh [/work/peers/limitador]
# limitador-server always links its RocksDB ("disk") storage, whose C++ build needs clang and a
# long compile; the benchmark uses its memory and redis storages only. So this puts the disk
# storage behind a cargo feature (cfg attributes inserted on the lines that name it; nothing else
# changes; and the key encoding the redis storage shares with it is compiled for either) and
# builds without it, with limitador's own release profile. Needs protoc
# (Debian: protobuf-compiler). Prints the binary's path and the commit built.
set -euo pipefail
src=${1:-/work/peers/limitador}
cd "$src"
command -v protoc >/dev/null || { echo "protoc missing: apt-get install protobuf-compiler" >&2; exit 1; }
gate='#[cfg(feature = "disk_storage")]'
if ! grep -q '^disk_storage = \["limitador/disk_storage"\]' limitador-server/Cargo.toml; then
  perl -0pi -e 's/\[features\]\n/[features]\ndefault = []\ndisk_storage = ["limitador\/disk_storage"]\n/; s/limitador = \{ path = "..\/limitador" \}/limitador = { path = "..\/limitador", default-features = false, features = ["redis_storage"] }/' limitador-server/Cargo.toml
  # main.rs: the import, the match arms and the constructor that name the disk storage.
  perl -0pi -e '
    s/DiskStorageConfiguration, //;
    s/(use crate::config::\{)/'"$gate"'\nuse crate::config::DiskStorageConfiguration;\n$1/;
    s/(\n)(use limitador::storage::disk::DiskStorage;)/$1'"$gate"'\n$2/;
    s/(\n\s*)(StorageConfiguration::Disk\(cfg\) =>)/$1'"$gate"'$1$2/;
    s/(\n\s*)(fn disk_limiter\()/$1'"$gate"'$1$2/;
    s/(\n\s*)(Some\(\("disk", sub\)\) =>)/$1'"$gate"'$1$2/;
  ' limitador-server/src/main.rs
  # config.rs: the variant and its settings type.
  perl -0pi -e '
    s/(\n\s*)(Disk\(DiskStorageConfiguration\),)/$1'"$gate"'$1$2/;
    s/(\n)(pub struct DiskStorageConfiguration)/$1'"$gate"'\n$2/;
  ' limitador-server/src/config.rs
fi
# The library's binary key encoding (keys.rs `bin`, and the counter.rs method it calls) is used by
# the redis storage too but compiled only with the disk storage; without it the library does not
# build. Compile both for either storage. (Each substitution matches only the unedited text.)
any='#[cfg(any(feature = "disk_storage", feature = "redis_storage"))]'
perl -0pi -e 's/#\[cfg\(feature = "disk_storage"\)\](\npub mod bin \{)/'"$any"'$1/' limitador/src/storage/keys.rs
perl -0pi -e 's/#\[cfg\(feature = "disk_storage"\)\](\n\s*pub\(crate\) fn variables_for_key\()/'"$any"'$1/' limitador/src/counter.rs
nice cargo build --release -p limitador-server --no-default-features >&2
echo "binary: $src/target/release/limitador-server"
echo "commit: $(git rev-parse HEAD)"
