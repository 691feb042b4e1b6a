/* kiln/io.h: tensors to and from files: IDX (the MNIST format, read only) and safetensors.
   A malformed or truncated file is an error naming the file and what is wrong, never a partial tensor. */
#ifndef KILN_IO_H
#define KILN_IO_H

struct kiln_tensor;

/* Reads an IDX file (magic 0 0 type ndims, big-endian int32 sizes, big-endian data); gzip is
   detected by its magic bytes. Type codes: 0x08 u8 -> KILN_U8; 0x09 i8, 0x0B i16, 0x0C i32 ->
   KILN_I32; 0x0D f32 -> KILN_F32; 0x0E f64 -> KILN_F64. A new CPU tensor, or NULL with an error. */
struct kiln_tensor *kiln_idx_read(const char *path);

/* KILN_OK when path names a regular file kiln can open for reading; else the error names op, the
   path and what it is ("a directory", "a FIFO (named pipe)", ...). Never blocks. Every reader of
   kiln checks its file this way. */
int kiln_file_check(const char *op, const char *path);

/* safetensors (the format of Hugging Face and PyTorch): an 8-byte little-endian header length N,
   N bytes of JSON {"__metadata__": {key: value}, name: {"dtype", "shape", "data_offsets"}} padded
   with spaces, then the data, little-endian and row-major. dtypes: F32 F64 F16 BF16 I64 I32 U8 BOOL.

   Writes n named tensors and nmeta string pairs to path, crash-safe: the bytes go to
   "<path>.tmp.<pid>", which is flushed to disk (fsync) and renamed over path, and the folder is
   flushed; on failure the temporary file is removed and path is untouched. Tensors on another
   device are copied to the CPU, non-contiguous ones written row-major. The data are laid out as
   the reference writer lays them out (larger elements first, then by name), so every tensor is
   aligned and the same tensors give the same bytes as PyTorch's safetensors. Returns a status. */
int kiln_safetensors_save(const char *path, int n, const char *const *names, struct kiln_tensor *const *tensors,
                          int nmeta, const char *const *meta_keys, const char *const *meta_values);

/* A safetensors file opened for reading: the header parsed and every entry checked against the file
   (dtype known, shape non-negative, offsets in bounds and in order, sizes equal to numel times the
   element size, the entries covering the data exactly, no overlap, BOOL bytes 0 or 1). */
struct kiln_safetensors;

enum kiln_safetensors_flags {
  KILN_SAFETENSORS_NO_MMAP = 1   /* read the file into memory instead of mapping it */
};

/* NULL with an error naming the file (and the entry) when anything is wrong. The file is mapped
   privately (copy on write): tensors may borrow the mapping, which is unmapped when the handle is
   closed and the last such tensor is released; writing to them never changes the file. */
struct kiln_safetensors *kiln_safetensors_open(const char *path, int flags);
/* Entries in the order of their data in the file; i counts from 0. */
int kiln_safetensors_count(const struct kiln_safetensors *f);
const char *kiln_safetensors_name(const struct kiln_safetensors *f, int i);
/* A new CPU tensor of entry i: a view of the mapping when its data are aligned, else a copy. */
struct kiln_tensor *kiln_safetensors_tensor(struct kiln_safetensors *f, int i);
/* The "__metadata__" pairs, in the order of the header. */
int kiln_safetensors_meta_count(const struct kiln_safetensors *f);
const char *kiln_safetensors_meta_key(const struct kiln_safetensors *f, int i);
const char *kiln_safetensors_meta_value(const struct kiln_safetensors *f, int i);
/* Tensors made from f stay valid after it is closed. */
void kiln_safetensors_close(struct kiln_safetensors *f);

#endif
