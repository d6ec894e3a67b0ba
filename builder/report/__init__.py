"""`sm120-stacks report STACK`: one self-contained HTML page per tested image, from what `test`
recorded (builder.verify's reports, builder.image's records) and `push` put in the registry
(builder.evidence). Reads only; changes nothing."""
