//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package reduce

// nativeLittleEndian is false on big-endian (or unknown) machines: payloads
// are little-endian on the wire, so Add takes the decoding path.
const nativeLittleEndian = false
