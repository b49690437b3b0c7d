"""Every wire and disk byte layout of bk, defined once (ARCHITECTURE.md, "One source of truth per format").

    entry     the digest-framed entry every layer stores untouched: ids, LAC, length, digest
              lengths by digest type, the master key's length, the explicit-LAC buffer
    wire      the v2 frame layouts (op codes, flags, sizes, offsets, header packer) and the
              protobuf field numbers the v3 ADD kernels read without the protobuf library
    journal   journal file headers (formats 1 and 2), record heads, meta-record and filler ids
    entrylog  entry-log file header, record size field, ledgers map, locations, file names
    index     LMDB keys and values: location keys, ledger records, log marks, state keys
    pxi       the generator of bk/_native/formats.pxi, the Cython view of these modules

A leaf package: its modules import only the standard library and each other at load time
(google_crc32c inside the few functions that checksum), never the rest of bk. So setup.py
can generate the .pxi from them before any kernel is built,
the pure kernel twins in bk._native can import them without running up the layers, and
spark/ and fuzz/ read the same names the bookie writes with. Every public name is unique
across the package (tests/unit/test_formats.py): `LOG_HEADER_BYTES` is the entry log's 1024,
`JOURNAL_V1_HEADER_BYTES` the journal's 16, `PACKET_HEADER_BYTES` the wire's 4.
"""
