/* kiln/io.h: file readers that make tensors: IDX (the MNIST format), plain or gzip-compressed.
   A malformed or truncated file is an error naming the file and the offset, never a partial tensor. */
#ifndef KILN_IO_H
#define KILN_IO_H

struct kiln_tensor;

/* Reads an IDX file (magic 0 0 type ndims, big-endian int32 sizes, big-endian data); gzip is
   detected by its magic bytes. Type codes: 0x08 u8 -> KILN_U8; 0x09 i8, 0x0B i16, 0x0C i32 ->
   KILN_I32; 0x0D f32 -> KILN_F32; 0x0E f64 -> KILN_F64. A new CPU tensor, or NULL with an error. */
struct kiln_tensor *kiln_idx_read(const char *path);

#endif
