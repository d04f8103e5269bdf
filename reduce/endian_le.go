//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package reduce

// nativeLittleEndian reports whether the machine's byte order is the wire's
// (little-endian). Only then may a payload be reinterpreted in place as a
// typed slice; otherwise Add decodes element by element.
const nativeLittleEndian = true
